"""Dispatching fleet workloads: SubmitWorkload stores a workload; a loop places each Job that
arrived on a member with room for its whole gang and sends it there; what members say of their
Jobs moves the workload on.

Rules it keeps:

- a workload is stored before any of its Jobs is dispatched, and a restarted hub dispatches on
  from what it stored;
- a Job goes to a member only while it has a session, and again only while the member never
  acknowledged it; one the member acknowledged and no longer reports failed there, and is
  dispatched again while attempts remain (:mod:`federation.hub.workloads`);
- the loop wakes at the next arrival, at a change of any workload, and every
  :data:`DISPATCH_EVERY` at least, on the hub's clock;
- one workload whose dispatching raises is stopped, Failed with the error as its message
  (:meth:`~federation.hub.workloads.Workload.stop`), logged once with its traceback, and the
  others are dispatched on; a failure outside any one workload is logged and the loop goes
  on;
- a workload stopped (CancelWorkload, or a failure to dispatch it) is stored stopped before
  any member hears of it; then every member it sent Jobs to is sent a ``DeleteJobs`` when it
  is connected, again at each session it opens, until it acknowledges (a restarted hub
  finishes a cancel);
- at most ``max_live`` workloads run at once (the hub's ``--max-live-workloads``): one more is
  refused with RESOURCE_EXHAUSTED;
- the newest :data:`KEEP_WORKLOADS` finished workloads are kept (and any whose Jobs a member
  must still delete).

Tracing: a workload gets a ``fleet.workload`` span, whose context is stored with it; every
sending of one of its Jobs (or of a deletion) is a ``hub.send_command`` child
(:mod:`federation.hub.sending`), and a cancel a ``hub.cancel_workload`` child, linked to the
call that asked for it.

The state of a workload is :mod:`federation.hub.workloads` and the choice of a member
:mod:`federation.hub.placement` (both pure); this module acts on them and must not decide a
Job's state itself, nor speak to sessions other than through
:func:`~federation.hub.sending.send_command`. Acks and results reach it from
:mod:`federation.hub.sessions`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterable

from federation.api import member_pb2
from federation.client.tracing import WORKLOAD_ID
from federation.hub import convert, tracing
from federation.hub.arrivals import Arrivals, RunTime, arrival_times, run_times
from federation.hub.errors import Refused
from federation.hub.membership import Member, State
from federation.hub.outcomes import Outcome
from federation.hub.placement import Job as Gang
from federation.hub.placement import Policy, place
from federation.hub.sending import Session, send_command
from federation.hub.shared import Shared
from federation.hub.workloads import (
    CANCELLED,
    DISPATCH_FAILED,
    JobRecord,
    JobState,
    Settings,
    Workload,
    delete_id,
    gpu_count,
    owner,
)
from primitives import propagation

logger = logging.getLogger(__name__)

#: Finished workloads kept (the oldest go first).
KEEP_WORKLOADS = 50
#: How often waiting Jobs look for room in the fleet, at most (s); arrivals are met on time.
DISPATCH_EVERY = 0.25
#: Room for Jobs without GPUs: the member's scheduler decides where they fit.
UNBOUNDED = 10**9


class Dispatching:
    """The fleet's workloads, the placing of their Jobs and the sending of them."""

    def __init__(self, shared: Shared, *, start_delay: float, max_live: int) -> None:
        self.shared = shared
        self.start_delay = start_delay
        self.max_live = max_live
        self.workloads: dict[str, Workload] = {}
        self._workload_changed: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        #: Workloads stopped whose stop is not on disk yet: no member is asked to delete
        #: their Jobs before it is (a restarted hub would not know it had asked).
        self._storing: set[str] = set()

    async def submit_workload(self, settings: Settings, arrivals: Arrivals, run_time: RunTime,
                              spec: dict[str, object], name: str,
                              start_delay: float | None, *, traceparent: str = "") -> Workload:
        """Store a workload for the dispatcher; ``traceparent`` names the parent of its span
        (default: the current span, the call's). Its Jobs' commands go out in its trace."""
        live = len(self.running_workloads())
        if live >= self.max_live:
            raise Refused("RESOURCE_EXHAUSTED",
                          f"the hub runs {live} workloads, its limit (--max-live-workloads "
                          f"{self.max_live}); wait for one to finish, cancel one ('fakefleet "
                          f"fleet cancel-workload ID'), or start the hub with a higher "
                          f"--max-live-workloads")
        self._check_targets(settings)
        with self.shared.tracer.start_as_current_span(
                "fleet.workload", context=propagation.parent(traceparent),
                attributes={"fakefleet.workload.name": name,
                            "fakefleet.workload.jobs": settings.jobs,
                            "fakefleet.workload.placement": settings.placement}) as span:
            workload = self._new_workload(settings, arrivals, run_time, spec, name,
                                          start_delay, propagation.traceparent(span))
            span.set_attribute(WORKLOAD_ID, workload.id)
            self.workloads[workload.id] = workload
            self._forget_old_workloads()
            await self.shared.store.commit()  # stored before any Job is dispatched
        logger.info("workload %s (%s): %d Jobs of %d pods, placement %s", workload.id,
                    name or "unnamed", settings.jobs, settings.pods, settings.placement)
        self._wake.set()
        return workload

    def _new_workload(self, settings: Settings, arrivals: Arrivals, run_time: RunTime,
                      spec: dict[str, object], name: str, start_delay: float | None,
                      traceparent: str) -> Workload:
        now = self.shared.clock.now()
        start = now + (self.start_delay if start_delay is None else start_delay)
        arrive = arrival_times(arrivals, settings.jobs, settings.seed)
        runs = run_times(run_time, settings.jobs, settings.seed)
        return Workload(
            id=f"w{secrets.token_hex(4)}", name=name, spec=spec, settings=settings,
            created_at=now, start_at=start,
            jobs=[JobRecord(index=index, arrive_at=start + at, run_seconds=seconds)
                  for index, (at, seconds) in enumerate(zip(arrive, runs, strict=True))],
            traceparent=traceparent)

    async def cancel_workload(self, workload_id: str) -> Workload:
        """Stop a running workload, store that, then ask its members to delete its Jobs."""
        workload = self.get_workload(workload_id)
        if workload.reason == CANCELLED:
            return workload  # cancelled before; its members are being asked already
        if workload.finished_at:
            raise Refused("FAILED_PRECONDITION",
                          f"workload_id: workload {workload.id} {workload.phase.value} "
                          f"already, with nothing left to cancel; only a Running workload "
                          f"can be cancelled")
        # In the workload's trace, which holds all it did; linked to the call that asked.
        with tracing.continuing(self.shared.tracer, "hub.cancel_workload",
                                workload.traceparent, {WORKLOAD_ID: workload.id},
                                links=propagation.links(propagation.traceparent())) as span:
            self._stop(workload, CANCELLED, "cancelled by a CancelWorkload call")
            await self._store_stops()
            self._send_deletions(workload, parent=tracing.of(span))
        logger.info("workload %s Cancelled: %d members to delete its Jobs", workload.id,
                    len(workload.deleting))
        return workload

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
        members = self.shared.membership.members
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
        largest = max(_capacity(members[name], settings.gpus_per_pod) for name in selected)
        if gang and largest < gang:
            raise Refused("FAILED_PRECONDITION",
                          f"spec: a Job needs {gang} GPUs ({settings.pods} pods x "
                          f"{settings.gpus_per_pod}), and the largest selected member has room "
                          f"for {largest}; it could never be placed: ask for fewer pods or "
                          f"GPUs, or select larger clusters")

    def _selected(self, settings: Settings) -> list[str]:
        return sorted(name for name, member in self.shared.membership.members.items()
                      if convert.selects(dict(settings.selector), member.identity)
                      and name != settings.manager)

    # -- the loop ----------------------------------------------------------------------------

    async def dispatch_forever(self) -> None:
        while True:
            now = self.shared.clock.now()
            try:
                wait = self.dispatch(now)
            except Exception:
                logger.exception("dispatching workloads failed")
                wait = 1.0
            if self._storing:  # stopped this round: stored, then their deletions go out
                try:
                    await self._store_stops()
                    continue
                except OSError as error:
                    logger.error("cannot store stopped workloads: %s (trying again)", error)
                    wait = 1.0
            self._wake.clear()
            await self.shared.clock.wait(self._wake, wait)

    def dispatch(self, now: float) -> float:
        """Place what arrived, send what is placed, sample utilisation; returns how long
        until there may be more to do."""
        wait = DISPATCH_EVERY
        for workload in self.running_workloads():
            try:
                self._dispatch(workload, now)
            except Exception as error:
                self._failed(workload, error)
                continue
            upcoming = workload.next_arrival()
            if upcoming is not None and upcoming > now:
                wait = min(wait, upcoming - now)
        for workload in self.deleting_workloads():
            self._send_deletions(workload)
        return max(wait, 0.01)

    def _dispatch(self, workload: Workload, now: float) -> None:
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
                session = self.shared.connected.get(job.cluster)
                if session is not None and \
                        (sent := self._send_job(session, workload, job)) is not None:
                    changed |= workload.sent(job, now)
                    changed |= workload.traced(job, sent)
        changed |= workload.sample(now, self._total_gpus(workload.settings))
        if changed:
            self.touched(workload)

    def _failed(self, workload: Workload, error: Exception) -> None:
        """Stop ``workload``, whose dispatching raised ``error``: called where it was caught,
        so the log has its traceback, once (a stopped workload is dispatched no more)."""
        logger.exception("workload %s: dispatching it failed; it is stopped, Failed, and the "
                         "other workloads go on", workload.id)
        self._stop(workload, DISPATCH_FAILED, f"the hub could not dispatch it: {error!r}")

    def _stop(self, workload: Workload, reason: str, message: str) -> None:
        workload.stop(self.shared.clock.now(), reason, message)
        self._storing.add(workload.id)
        self.touched(workload)

    async def _store_stops(self) -> None:
        """Write the state with every stop made so far (until then, the members of those
        workloads are asked nothing)."""
        storing = set(self._storing)
        await self.shared.store.commit()
        self._storing -= storing

    def _send_deletions(self, workload: Workload, session: Session | None = None, *,
                        parent: str = "") -> bool:
        """Ask each connected member that must still delete ``workload``'s Jobs and was not
        asked on its session yet (``session``: that member, again); a sending is a child of
        ``parent`` (default: the workload's span). Whether one went out."""
        sent_any = False
        for cluster, sent in workload.deleting.items():
            if session is None:
                target = None if sent else self.shared.connected.get(cluster)
            else:
                target = session if cluster == session.cluster else None
            if target is not None and send_command(
                    self.shared.tracer, target, convert.delete_command_message(workload, cluster),
                    "", parent or workload.traceparent) is not None:
                workload.deleting[cluster] = sent_any = True
        return sent_any

    def _place(self, workload: Workload, due: list[JobRecord]) -> bool:
        settings = workload.settings
        held: dict[str, int] = {}
        for other in self.running_workloads():  # a finished one's Jobs hold nothing
            for cluster, gpus in other.gpus_held().items():
                held[cluster] = held.get(cluster, 0) + gpus
        members = self.shared.membership.members
        free = {name: _capacity(members[name], settings.gpus_per_pod) - held.get(name, 0)
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
        members = self.shared.membership.members
        return sum(gpu_count(members[name].inventory.allocatable.get("nvidia.com/gpu", "0"))
                   for name in self._selected(settings))

    def send_outstanding(self, session: Session, now: float) -> bool:
        """Ask the member again to delete the Jobs of stopped workloads, and send it every Job
        placed there that it never acknowledged; returns whether a workload changed (the
        caller stores it)."""
        changed = False
        for workload in self.deleting_workloads():
            changed |= self._send_deletions(workload, session)
        for workload in self.running_workloads():
            try:
                for job in workload.jobs:
                    if job.cluster == session.cluster and job.state in (JobState.PLACED,
                                                                        JobState.SENT):
                        sent = self._send_job(session, workload, job)
                        if sent is None:
                            return changed
                        workload.sent(job, now)
                        workload.traced(job, sent)
                        changed = True
            except Exception as error:
                self._failed(workload, error)
                changed = True
        return changed

    def _send_job(self, session: Session, workload: Workload, job: JobRecord) -> str | None:
        return send_command(self.shared.tracer, session, convert.job_command_message(workload, job),
                            job.traceparent, workload.traceparent)

    # -- what members say ------------------------------------------------------------------------

    def running_workloads(self) -> list[Workload]:
        return sorted((w for w in self.workloads.values() if not w.finished_at),
                      key=lambda w: w.created_at)

    def deleting_workloads(self) -> list[Workload]:
        """Stopped workloads, stored so, whose Jobs some member must still delete."""
        return [w for w in self.workloads.values() if w.deleting and w.id not in self._storing]

    def workload_of(self, command_id: str) -> Workload | None:
        parsed = owner(command_id)
        return None if parsed is None else self.workloads.get(parsed[0])

    def acknowledged(self, workload: Workload, command_id: str) -> None:
        cluster = _deletion(workload, command_id)
        if cluster is not None:
            changed = workload.deleted(cluster)
        else:
            changed = workload.acknowledged(command_id, self.shared.clock.now())
        if changed:
            self.touched(workload)

    def reported(self, workload: Workload, result: member_pb2.CommandResult,
                 now: float) -> bool:
        """Take a member's report of one of ``workload``'s Jobs (or of their deletion) in;
        whether it changed."""
        cluster = _deletion(workload, result.command_id)
        if cluster is None:
            changed = workload.reported(result.command_id, convert.progress(result), now)
        else:
            outcome = convert.OUTCOMES[result.phase]
            changed = outcome is not Outcome.RUNNING and workload.deleted(
                cluster, "" if outcome is Outcome.SUCCEEDED
                else f"could not delete its Jobs: {result.message}")
        if changed:
            self.touched(workload)
        return changed

    def resynced(self, cluster: str, reported: Iterable[str], now: float) -> bool:
        """After ``cluster``'s Hello, which lists the commands it has (none: it left the
        fleet, and its Jobs with it): whether a workload changed."""
        reported = list(reported)
        changed = False
        for workload in self.running_workloads():
            if workload.resynced(cluster, reported, now):
                changed = True
                self.touched(workload)
        for workload in [w for w in self.workloads.values() if w.deleting]:
            if workload.resynced_deleting(cluster, reported):
                changed = True
                self.touched(workload)
        return changed

    def touched(self, workload: Workload) -> None:
        """``workload`` changed: settle it, store it, wake the loop and its watchers."""
        now = self.shared.clock.now()
        if workload.settle(now):
            report = workload.report(now)
            logger.info("workload %s %s: %d succeeded, %d failed in %.1fs", workload.id,
                        workload.phase.value, report.counts.succeeded, report.counts.failed,
                        report.makespan)
        self.shared.store.changed()
        self._wake.set()
        event = self._workload_changed.pop(workload.id, None)
        if event is not None:
            event.set()

    def _forget_old_workloads(self) -> None:
        finished = sorted((w for w in self.workloads.values()
                           if w.finished_at and not w.deleting),
                          key=lambda w: w.created_at, reverse=True)
        for workload in finished[KEEP_WORKLOADS:]:
            del self.workloads[workload.id]


def _capacity(member: Member, gpus_per_pod: int) -> int:
    """GPUs a member has room for in gangs of such pods (whole pods per Ready node)."""
    if gpus_per_pod <= 0:
        return UNBOUNDED
    return sum(pool.ready * (gpu_count(pool.allocatable.get("nvidia.com/gpu", "0"))
                             // gpus_per_pod) * gpus_per_pod
               for pool in member.inventory.pools)


def _names(settings: Settings) -> list[str]:
    names = settings.selector.get("names") or []
    assert isinstance(names, list)
    return [str(name) for name in names]


def _deletion(workload: Workload, command_id: str) -> str | None:
    """The cluster of ``workload``'s deletion ``command_id``; None for any other command."""
    parsed = owner(command_id)
    return parsed[1] if parsed is not None and command_id == delete_id(*parsed) else None
