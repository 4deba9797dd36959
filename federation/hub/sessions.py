"""The members' side of the hub: Register and Deregister, and each member's Session, with
what it carries both ways (heartbeats, acknowledgements, results of commands).

Rules it keeps:

- one session per member: a new one (a reconnect the hub had not noticed yet) replaces the old;
- a member's Hello is the truth about its commands: what it reports is taken in, a command it
  acknowledged before and no longer has was lost there, and what it never acknowledged is sent
  (:mod:`federation.hub.running`, :mod:`federation.hub.dispatching`);
- a member speaks only of its own commands (an id names its cluster);
- heartbeats go to every session with a number that keeps rising across hub restarts
  (:attr:`Sessions.seq`), which the member echoes as proof that it hears the hub.

Tracing: an ack and a result are taken in as ``hub.command_acknowledged`` and
``hub.command_result`` spans, children of the context the member's message carries (else of
the command's first sending). Heartbeats are untraced.

This module routes what a member says to the run or workload it is about, and must not change
either's state itself; it knows nothing of gRPC (:mod:`federation.hub.services` reads and
writes the streams).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from typing import Any

from opentelemetry import trace

from federation.api import member_pb2
from federation.hub import convert, tracing
from federation.hub.dispatching import Dispatching
from federation.hub.errors import Refused
from federation.hub.membership import HostConflict, Identity, Inventory, Member
from federation.hub.running import Running
from federation.hub.runs import parse_command_id
from federation.hub.sending import Session
from federation.hub.shared import Shared
from federation.hub.watching import Watching
from federation.hub.workloads import owner as workload_command_owner


@dataclasses.dataclass
class Counters:
    """What the hub processed since it started, for its stats line."""

    heartbeats: int = 0
    acknowledged: int = 0


class Sessions:
    """Registration, the open sessions, and what members say in them."""

    def __init__(self, shared: Shared, *, running: Running, dispatching: Dispatching,
                 watching: Watching) -> None:
        self.shared = shared
        self.running = running
        self.dispatching = dispatching
        self.watching = watching
        self.counters = Counters()
        #: The number of the last heartbeat sent (the hub sets where it starts).
        self.seq = 0

    # -- members ---------------------------------------------------------------------------------

    async def register(self, identity: Identity, inventory: Inventory) -> Member:
        known = identity.key in self.shared.membership.members
        try:
            member = self.shared.membership.register(identity, inventory, self.shared.clock.now())
        except HostConflict as conflict:
            raise Refused("ALREADY_EXISTS", str(conflict)) from conflict
        self.watching.publish([member], added=not known)
        await self.shared.store.commit()
        return member

    async def deregister(self, cluster: str, host: str) -> None:
        """``cluster`` leaves the fleet, if ``host`` is the host that registered it (or it
        was registered with none): a host takes out only what it put in."""
        holder = self.shared.membership.holder(cluster)
        if holder and holder != host:
            raise Refused("FAILED_PRECONDITION",
                          f"host: cluster {cluster!r} is registered by host {holder!r}, not "
                          f"{host or '(none)'!r}; it stays in the fleet")
        session = self.shared.connected.pop(cluster, None)
        if session is not None:
            session.close()
        member = self.shared.membership.remove(cluster)
        now = self.shared.clock.now()
        self.running.left(cluster, now)
        self.dispatching.resynced(cluster, (), now)  # its Jobs went with it
        if member is not None:
            self.watching.publish([member], deleted=True)
        await self.shared.store.commit()

    # -- sessions --------------------------------------------------------------------------------

    def open_session(self, cluster: str,
                     results: Iterable[member_pb2.CommandResult]) -> Session:
        """A member said hello: its old session (if any) ends, what it reports is taken as
        the truth about its commands, and what it never got is sent."""
        if cluster not in self.shared.membership.members:
            raise Refused("FAILED_PRECONDITION",
                          f"cluster {cluster!r} is not registered: call Register first")
        results = list(results)
        for result in results:
            owner = _owner(result.command_id)
            if owner is not None and owner != cluster:
                raise Refused("PERMISSION_DENIED",
                              f"hello.commands: command {result.command_id!r} belongs to "
                              f"cluster {owner!r}; a member reports its own commands only")
        old = self.shared.connected.pop(cluster, None)
        if old is not None:
            old.close()
        session = Session(cluster)
        self.shared.connected[cluster] = session
        now = self.shared.clock.now()
        reported = [result.command_id for result in results]
        changed = False
        for result in results:
            changed |= self._apply_result(result, now)
        changed |= self.running.resynced(cluster, reported, now)
        changed |= self.dispatching.resynced(cluster, reported, now)
        self.watching.publish([self.shared.membership.connect(cluster, now)])
        # Runs first, then workloads; once the session is dropped, neither sends more.
        changed |= self.running.send_outstanding(session, now)
        changed |= self.dispatching.send_outstanding(session, now)
        if changed:
            self.shared.store.changed()
        return session

    def close_session(self, session: Session) -> None:
        session.close()
        if self.shared.connected.get(session.cluster) is session:
            del self.shared.connected[session.cluster]
            self.watching.publish([self.shared.membership.disconnect(
                session.cluster, self.shared.clock.now())])

    def current(self, session: Session) -> bool:
        return self.shared.connected.get(session.cluster) is session

    def heartbeat_all(self, now: float) -> None:
        self.seq += 1
        beat = member_pb2.HubMessage(heartbeat=member_pb2.HubHeartbeat(
            seq=self.seq, sent_at=convert.timestamp(now)))
        for session in list(self.shared.connected.values()):
            session.send(beat)

    # -- what members say ------------------------------------------------------------------------

    def heartbeat(self, session: Session, message: member_pb2.MemberHeartbeat) -> None:
        self.counters.heartbeats += 1
        inventory = convert.inventory(message.inventory) if message.HasField("inventory") \
            else None
        changed = self.shared.membership.heartbeat(session.cluster, message.hub_seq,
                                                   inventory, self.shared.clock.now())
        if changed is not None:
            self.watching.publish([changed])
            self.shared.store.changed()

    def acknowledged(self, session: Session, command_id: str, traceparent: str = "") -> None:
        """The member has the command; ``traceparent``: the context of its execution."""
        self._check_owner(session.cluster, command_id, "ack.command_id")
        self.counters.acknowledged += 1
        self.shared.membership.heard(session.cluster, self.shared.clock.now())
        with self._taking_in("hub.command_acknowledged", traceparent, command_id,
                             tracing.command_id_attributes(session.cluster, command_id)):
            workload = self.dispatching.workload_of(command_id)
            if workload is not None:
                self.dispatching.acknowledged(workload, command_id)
            else:
                self.running.acknowledged(command_id)

    def reported(self, session: Session, result: member_pb2.CommandResult,
                 traceparent: str = "") -> None:
        """A command's result; ``traceparent``: the context the member reported it in."""
        self._check_owner(session.cluster, result.command_id, "result.command_id")
        self.shared.membership.heard(session.cluster, self.shared.clock.now())
        with self._taking_in("hub.command_result", traceparent, result.command_id,
                             tracing.result_attributes(session.cluster, result)):
            if self._apply_result(result, self.shared.clock.now()):
                self.shared.store.changed()

    def _apply_result(self, result: member_pb2.CommandResult, now: float) -> bool:
        workload = self.dispatching.workload_of(result.command_id)
        if workload is not None:
            return self.dispatching.reported(workload, result, now)
        return self.running.reported(convert.report(result), now)

    def _taking_in(self, name: str, traceparent: str, command_id: str,
                   attributes: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """A member's message about a command, handled as a child of the context it carries
        (else of the command's first sending: a member that sent none stays in the trace)."""
        return tracing.continuing(self.shared.tracer, name,
                                  traceparent or self._traceparent_of(command_id), attributes,
                                  kind=trace.SpanKind.CONSUMER)

    def _traceparent_of(self, command_id: str) -> str:
        """The context of the first sending of a command of this hub ("" if none)."""
        workload = self.dispatching.workload_of(command_id)
        if workload is not None:
            return workload.traceparent_of(command_id)
        run = self.running.run_of(command_id)
        return run.traceparent_of(command_id) if run is not None else ""

    def _check_owner(self, cluster: str, command_id: str, field: str) -> None:
        owner = _owner(command_id)
        if owner is not None and owner != cluster:
            raise Refused("PERMISSION_DENIED",
                          f"{field}: command {command_id!r} belongs to cluster {owner!r}; "
                          f"this session speaks for {cluster!r}")


def _owner(command_id: str) -> str | None:
    """The member a command of this hub was made for (its id's middle part)."""
    parsed = parse_command_id(command_id) or workload_command_owner(command_id)
    return None if parsed is None else parsed[1]
