"""Fleet-wide runs of a FaultPlan, and each member's part: pure state, no I/O.

A run sends every selected member one command, ``StartPlan`` (id ``<run>/<cluster>/start``);
cancelling it sends ``StopPlan`` (``<run>/<cluster>/stop``) to those that had the first. A
member's part moves

    Pending → Sent → Acknowledged → Running → Succeeded | Failed | Refused
                                           ↘ Cancelled (after a StopPlan)

and the run is Succeeded when every part is Succeeded, Failed when every part finished and one
did not succeed, Cancelled once cancelled parts are all finished.

What is sent again after a reconnect (:meth:`Run.outstanding`) is only what the member never
acknowledged: a member reports in its Hello what it has (its FaultPlans), and an acknowledged
command is never resent, so none runs twice. One the member acknowledged and no longer reports
was lost in the member (its FaultPlan deleted by hand): the part fails, saying so.

Trace context is kept with the run, so that a command sent again (after a reconnect, or by a
restarted hub) stays in the run's trace: the run's own (its ``fleet.run`` span) and, per part,
that of the first sending of its StartPlan and of its StopPlan.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

from federation.hub.outcomes import Outcome


class Part(enum.Enum):
    PENDING = "Pending"
    SENT = "Sent"
    ACKNOWLEDGED = "Acknowledged"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REFUSED = "Refused"
    CANCELLED = "Cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED

    @property
    def delivered(self) -> bool:
        return self not in (Part.PENDING, Part.SENT)


FINISHED = frozenset({Part.SUCCEEDED, Part.FAILED, Part.REFUSED, Part.CANCELLED})


class Phase(enum.Enum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


@dataclasses.dataclass(frozen=True)
class Report:
    command_id: str
    outcome: Outcome
    verdict: str = ""
    steps_done: str = ""
    message: str = ""
    object: str = ""


@dataclasses.dataclass(frozen=True)
class Command:
    """A command to send: StartPlan (``stop`` False) or StopPlan of ``start_id``."""

    id: str
    run_id: str
    cluster: str
    stop: bool
    plan: str
    start_at: float
    start_id: str


@dataclasses.dataclass
class MemberPart:
    cluster: str
    state: Part = Part.PENDING
    verdict: str = ""
    steps_done: str = ""
    message: str = ""
    object: str = ""
    sent_at: float = 0.0
    acknowledged_at: float = 0.0
    finished_at: float = 0.0
    stop_acknowledged: bool = False
    #: W3C traceparents of the first sending of the StartPlan and of the StopPlan ("": not
    #: sent yet, or untraced).
    traceparent: str = ""
    stop_traceparent: str = ""


def start_id(run_id: str, cluster: str) -> str:
    return f"{run_id}/{cluster}/start"


def stop_id(run_id: str, cluster: str) -> str:
    return f"{run_id}/{cluster}/stop"


def parse_command_id(command_id: str) -> tuple[str, str, str] | None:
    """(run id, cluster, start|stop), or None for an id no run of this hub made. The cluster
    is a member's name in the fleet: ``namespace/name`` has a slash of its own."""
    run, _, rest = command_id.partition("/")
    cluster, _, kind = rest.rpartition("/")
    if kind not in ("start", "stop") or not run or not cluster or cluster.count("/") > 1:
        return None
    return run, cluster, kind


@dataclasses.dataclass
class Run:
    id: str
    name: str
    plan: str
    selector: dict[str, object]
    created_at: float
    start_at: float
    parts: dict[str, MemberPart]
    cancelled: bool = False
    finished_at: float = 0.0
    #: The W3C traceparent of the run's span ("": untraced).
    traceparent: str = ""

    @property
    def phase(self) -> Phase:
        states = [part.state for part in self.parts.values()]
        if not all(state.finished for state in states):
            return Phase.RUNNING
        if self.cancelled:
            return Phase.CANCELLED
        if all(state is Part.SUCCEEDED for state in states):
            return Phase.SUCCEEDED
        return Phase.FAILED

    @property
    def verdict(self) -> str:
        """Failed as soon as one member's plan failed its expectations; Passed when all passed."""
        verdicts = [part.verdict for part in self.parts.values()]
        if "Failed" in verdicts:
            return "Failed"
        if verdicts and all(verdict == "Passed" for verdict in verdicts):
            return "Passed"
        return ""

    def outstanding(self, cluster: str) -> list[Command]:
        """What ``cluster`` must still be sent (after it connected and reported its Hello)."""
        part = self.parts.get(cluster)
        if part is None:
            return []
        if self.cancelled:
            # A start sent but not acknowledged may have arrived: it is stopped too.
            if part.state is not Part.PENDING and not part.state.finished \
                    and not part.stop_acknowledged:
                return [self._command(cluster, stop=True)]
            return []
        if part.state in (Part.PENDING, Part.SENT):
            return [self._command(cluster, stop=False)]
        return []

    def _command(self, cluster: str, *, stop: bool) -> Command:
        return Command(id=stop_id(self.id, cluster) if stop else start_id(self.id, cluster),
                       run_id=self.id, cluster=cluster, stop=stop, plan="" if stop else self.plan,
                       start_at=self.start_at, start_id=start_id(self.id, cluster))

    def traceparent_of(self, command_id: str) -> str:
        """The context of the first sending of command ``command_id`` ("" if none)."""
        parsed = parse_command_id(command_id)
        part = self.parts.get(parsed[1]) if parsed is not None else None
        if parsed is None or part is None:
            return ""
        return part.stop_traceparent if parsed[2] == "stop" else part.traceparent

    # -- transitions: each returns whether anything changed ---------------------------------

    def traced(self, command_id: str, traceparent: str) -> bool:
        """Keep the context of a command's first sending (later ones are its children)."""
        parsed = parse_command_id(command_id)
        if parsed is None or parsed[1] not in self.parts or not traceparent \
                or self.traceparent_of(command_id):
            return False
        part = self.parts[parsed[1]]
        if parsed[2] == "stop":
            part.stop_traceparent = traceparent
        else:
            part.traceparent = traceparent
        return True

    def sent(self, cluster: str, now: float) -> bool:
        part = self.parts[cluster]
        if part.state is Part.PENDING:
            part.state, part.sent_at = Part.SENT, now
            return True
        return False

    def acknowledged(self, command_id: str, now: float) -> bool:
        parsed = parse_command_id(command_id)
        if parsed is None or parsed[1] not in self.parts:
            return False
        part = self.parts[parsed[1]]
        if parsed[2] == "stop":
            changed = not part.stop_acknowledged
            part.stop_acknowledged = True
            return changed
        if part.state in (Part.PENDING, Part.SENT):
            part.state, part.acknowledged_at = Part.ACKNOWLEDGED, now
            return True
        return False

    def reported(self, report: Report, now: float) -> bool:
        parsed = parse_command_id(report.command_id)
        if parsed is None or parsed[1] not in self.parts:
            return False
        part = self.parts[parsed[1]]
        before = dataclasses.replace(part)
        if parsed[2] == "stop":
            part.stop_acknowledged = True
            if report.outcome is not Outcome.RUNNING and not part.state.finished:
                part.state, part.finished_at = Part.CANCELLED, now
                part.message = report.message or "cancelled: the member stopped the plan"
            return part != before
        if part.state.finished:
            return False  # what finished stays as it finished
        if not part.acknowledged_at:
            part.acknowledged_at = now
        part.verdict, part.steps_done = report.verdict, report.steps_done
        part.message, part.object = report.message, report.object or part.object
        part.state = {Outcome.RUNNING: Part.RUNNING, Outcome.SUCCEEDED: Part.SUCCEEDED,
                      Outcome.FAILED: Part.FAILED, Outcome.REFUSED: Part.REFUSED}[report.outcome]
        if part.state.finished:
            part.finished_at = now
        return part != before

    def resynced(self, cluster: str, reported: Iterable[str], now: float) -> bool:
        """After a Hello: a part acknowledged before but not reported now was lost in the
        member (or, once cancelled, stopped)."""
        part = self.parts.get(cluster)
        if part is None or not part.state.delivered or part.state.finished:
            return False
        if start_id(self.id, cluster) in set(reported):
            return False
        part.finished_at = now
        if self.cancelled:
            part.state, part.message = Part.CANCELLED, "cancelled: the member stopped the plan"
        else:
            part.state = Part.FAILED
            part.message = ("the member no longer has the plan it acknowledged (was its "
                            f"FaultPlan {part.object or 'object'} deleted?); it is not run again")
        return True

    def left(self, cluster: str, now: float) -> bool:
        """The member left the fleet (deregistered): its part fails, unless it finished."""
        part = self.parts[cluster]
        if part.state.finished:
            return False
        part.state, part.finished_at = Part.FAILED, now
        part.message = "the member left the fleet (deregistered)"
        return True

    def cancel(self, now: float) -> bool:
        if self.cancelled or self.phase is not Phase.RUNNING:
            return False
        self.cancelled = True
        for part in self.parts.values():
            if part.state is Part.PENDING:
                part.state, part.finished_at = Part.CANCELLED, now
                part.message = "cancelled before the member received it"
        return True

    def settle(self, now: float) -> None:
        if self.phase is not Phase.RUNNING and not self.finished_at:
            self.finished_at = now
