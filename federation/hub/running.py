"""Running fleet-wide fault plans: RunPlan stores a run and fans its commands out to the members
it selects; CancelRun stops them; what members say of their part settles the run.

Rules it keeps:

- a run is stored before any member hears of it, and so is its cancellation: while the write of
  a run's change is under way, no session is sent that run's commands (a session opened
  meanwhile would be sent them, and the fan-out again);
- a command goes to a member only while it has a session, and again only if the member never
  acknowledged it (:meth:`federation.hub.runs.Run.outstanding`);
- the newest finished runs are kept, within :data:`KEEP_RUNS` and :data:`KEEP_PARTS` (every
  write of the store encodes every kept run, on the hub's loop).

Tracing: a run gets a ``fleet.run`` span, whose context is stored with it; its fan-out is a
``hub.fanout`` span, every sending a ``hub.send_command`` child (:mod:`federation.hub.sending`).

The state of a run is :mod:`federation.hub.runs` (pure); this module acts on it and must not
decide a part's state itself, nor speak to sessions other than through
:func:`~federation.hub.sending.send_command`. Acks and results reach it from
:mod:`federation.hub.sessions`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from federation.client.tracing import RUN_ID
from federation.hub import convert, tracing
from federation.hub.errors import Refused
from federation.hub.runs import MemberPart, Phase, Report, Run, parse_command_id
from federation.hub.sending import Session, send_command
from federation.hub.shared import Shared
from primitives import propagation

logger = logging.getLogger(__name__)

#: Finished runs kept (the oldest go first).
KEEP_RUNS = 200
#: ... and at most this many member parts in all: every store write encodes every kept run
#: (about 4.5 ms per 1000 parts, on the hub's loop).
KEEP_PARTS = 20_000


class Running:
    """The fleet's runs, and the sending of their commands."""

    def __init__(self, shared: Shared, *, start_delay: float) -> None:
        self.shared = shared
        self.start_delay = start_delay
        self.runs: dict[str, Run] = {}
        self._run_changed: dict[str, asyncio.Event] = {}
        #: Runs whose newest change is being written: no member hears of it until it is stored
        #: (a session opened meanwhile would otherwise be sent it, and the fan-out again).
        self._storing: set[str] = set()

    async def run_plan(self, plan: str, selector: dict[str, Any], start_delay: float | None,
                       name: str, *, traceparent: str = "") -> Run:
        """Store a run, then send its commands; ``traceparent`` names the parent of the run's
        span (default: the current span, the call's)."""
        members = sorted(m.name for m in self.shared.membership.members.values()
                         if convert.selects(selector, m.identity))
        if not members:
            known = ", ".join(sorted(self.shared.membership.members)) or "none yet"
            raise Refused("FAILED_PRECONDITION",
                          f"clusters: the selector picks no registered member (members: "
                          f"{known}); change the selector or let the clusters join first")
        with self.shared.tracer.start_as_current_span(
                "fleet.run", context=propagation.parent(traceparent),
                attributes={"fakefleet.run.name": name,
                            "fakefleet.run.members": len(members)}) as span:
            now = self.shared.clock.now()
            run = Run(id=f"r{secrets.token_hex(4)}", name=name, plan=plan, selector=selector,
                      created_at=now,
                      start_at=now + (self.start_delay if start_delay is None
                                      else start_delay),
                      parts={cluster: MemberPart(cluster=cluster) for cluster in members},
                      traceparent=propagation.traceparent(span))
            span.set_attribute(RUN_ID, run.id)
            self.runs[run.id] = run
            self.forget_old_runs()
            await self._store_run(run)  # stored (with its trace) before any member hears of it
            with self.shared.tracer.start_as_current_span(
                    "hub.fanout", attributes={RUN_ID: run.id}) as fanout:
                connected = self._fan_out(run, members, propagation.traceparent(fanout))
                fanout.set_attribute("fakefleet.fanout.connected", connected)
            self._changed(run)
        return run

    async def _store_run(self, run: Run) -> None:
        """Write the state with ``run``'s change; until then no session is sent its commands."""
        self._storing.add(run.id)
        try:
            await self.shared.store.commit()
        finally:
            self._storing.discard(run.id)

    def _fan_out(self, run: Run, clusters: Iterable[str], parent: str) -> int:
        """Send what ``run`` still owes each connected member of ``clusters``, each sending a
        child of ``parent``; returns how many were connected."""
        connected = 0
        for cluster in clusters:
            session = self.shared.connected.get(cluster)
            if session is not None:
                connected += 1
                self.send_outstanding(session, self.shared.clock.now(), runs=[run], parent=parent)
        return connected

    async def cancel_run(self, run_id: str) -> Run:
        run = self.get_run(run_id)
        if run.cancel(self.shared.clock.now()):
            # In the run's trace, which holds all that the run did; linked to the call that
            # asked for it.
            with tracing.continuing(self.shared.tracer, "hub.cancel_run", run.traceparent,
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

    def send_outstanding(self, session: Session, now: float,
                         runs: Iterable[Run] | None = None, *, parent: str = "") -> bool:
        """Send the member what it must still be sent of ``runs`` (default: of every run it
        has a part in); a first sending is a child of ``parent`` (default: the run's span).
        Returns whether a run changed."""
        changed = False
        for run in runs if runs is not None else self.runs_of(session.cluster):
            if run.id in self._storing:  # its fan-out follows the write
                continue
            for command in run.outstanding(session.cluster):
                sent = send_command(self.shared.tracer, session, convert.command_message(command),
                                    run.traceparent_of(command.id), parent or run.traceparent)
                if sent is None:
                    return changed
                changed |= run.sent(session.cluster, now)
                changed |= run.traced(command.id, sent)
        return changed

    # -- what members say ------------------------------------------------------------------------

    def runs_of(self, cluster: str) -> list[Run]:
        return sorted((run for run in self.runs.values() if cluster in run.parts),
                      key=lambda run: run.created_at)

    def run_of(self, command_id: str) -> Run | None:
        parsed = parse_command_id(command_id)
        return None if parsed is None else self.runs.get(parsed[0])

    def acknowledged(self, command_id: str) -> None:
        run = self.run_of(command_id)
        if run is not None and run.acknowledged(command_id, self.shared.clock.now()):
            self._changed(run)

    def reported(self, report: Report, now: float) -> bool:
        """Take a member's report in; whether a run changed (the caller stores it)."""
        run = self.run_of(report.command_id)
        if run is None or not run.reported(report, now):
            return False
        self._changed(run, store=False)
        return True

    def resynced(self, cluster: str, reported: Sequence[str], now: float) -> bool:
        """After ``cluster``'s Hello, which lists the commands it has: whether a run changed
        (the caller stores it)."""
        changed = False
        for run in self.runs_of(cluster):
            changed |= run.resynced(cluster, reported, now)
            self._settle(run, now)
        return changed

    def left(self, cluster: str, now: float) -> None:
        """``cluster`` left the fleet: its unfinished parts fail."""
        for run in self.runs_of(cluster):
            if run.left(cluster, now):
                self._changed(run)

    def _changed(self, run: Run, *, store: bool = True) -> None:
        self._settle(run, self.shared.clock.now())
        if store:
            self.shared.store.changed()
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

    def forget_old_runs(self) -> None:
        """Keep the newest finished runs, within KEEP_RUNS and KEEP_PARTS."""
        finished = sorted((run for run in self.runs.values() if run.finished_at),
                          key=lambda run: run.created_at, reverse=True)
        kept = parts = 0
        for run in finished:
            kept, parts = kept + 1, parts + len(run.parts)
            if kept > KEEP_RUNS or parts > KEEP_PARTS:
                del self.runs[run.id]
