"""What of a pod's status the engine owns, as a kubelet's status manager owns it, and what to do
when the pod watch shows another writer's version of it. Pure: no I/O, no clock.

The kubelet compares the status the API shows with its own on every sync (10 s) and writes its
own back when they differ: the node-lifecycle controller marking the pods of an unreachable
node NotReady heals by itself once the kubelet reaches the API again. The engine does the same
from what its one pod watch already shows (no read per pod): each event's status is reduced to
what the engine owns (:func:`owned`: the phase, the statuses of the conditions a kubelet sets,
every container's state, readiness and restart count; times and messages are not compared, as
they say when, not what) and judged against the engine's own view (:func:`judge`).

The kubelet's rules hold here too:

- a terminal phase never goes back: a pod another writer ended (Failed by the pod garbage
  collector, say) is taken as it is, never written Running again;
- a pod on a node that is not Ready (a NotReady or Unreachable fault, a node the engine itself
  says is not ready) is not written back: that its pods are not Ready is what the fault says,
  and a kubelet that cannot reach the API writes nothing; the engine writes once the node is
  Ready again;
- a pod being deleted, or gone, is left alone.

Each pod's :class:`Ownership` keeps what this needs and says what to do (:data:`Action`); the
pod lifecycle acts on it. A change is written back :data:`HEAL_AFTER` after the watch showed it,
not at once: an event older than the engine's own last write (a watch running late) is followed
by that write's echo within it, and then nothing is written. While a step of the pod is being
written, its own echo may come before the step is committed: the watch is only noted then, and
judged once the step is over (an end another writer gave the pod meanwhile is the pod's, and
written back if the engine's write went over it).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from operators.engine.pods import TERMINAL

#: The pod conditions a kubelet sets (PodScheduled is the scheduler's; others are carried).
KUBELET_CONDITIONS = frozenset({"PodReadyToStartContainers", "Initialized", "Ready",
                                "ContainersReady"})

#: A status reduced to what the engine owns: phase, the kubelet's conditions, the containers.
Owned = tuple[Any, ...]
#: Seconds from the watch showing another writer's status to the engine's written back: within
#: the kubelet's sync period (10 s).
HEAL_AFTER = 5.0


class Verdict(enum.Enum):
    """What to do with a pod whose status the watch shows."""

    AGREES = "agrees"  # the API shows the engine's view: nothing to do
    ADOPT = "adopt"  # another writer ended the pod: take its terminal status as the pod's life
    HEAL = "heal"  # another writer changed what the engine owns: write the engine's view back
    WAIT = "wait"  # changed, but its node is not Ready: write back once it is


def owned(status: Mapping[str, Any]) -> Owned:
    """The part of ``status`` the engine owns, comparable with ``==``."""
    conditions = frozenset((condition.get("type"), condition.get("status"))
                           for condition in status.get("conditions") or ()
                           if condition.get("type") in KUBELET_CONDITIONS)
    return (status.get("phase"), conditions, _containers(status.get("containerStatuses")),
            _containers(status.get("initContainerStatuses")))


def _containers(statuses: Iterable[Mapping[str, Any]] | None) -> tuple[Any, ...]:
    return tuple((status.get("name"), next(iter(status.get("state") or {}), None),
                  status.get("ready"), status.get("restartCount"))
                 for status in statuses or ())


def phase(view: Owned) -> Any:
    return view[0]


def judge(seen: Owned, expected: Owned, *, node_ready: bool) -> Verdict:
    """What to do about a pod the watch shows as ``seen`` where the engine's own status is
    ``expected`` (both :func:`owned`), its node Ready or not."""
    if seen == expected:
        return Verdict.AGREES
    if phase(seen) in TERMINAL and phase(seen) != phase(expected):
        return Verdict.ADOPT
    return Verdict.HEAL if node_ready else Verdict.WAIT


@dataclasses.dataclass(frozen=True)
class Heal:
    """Write the engine's own status back at ``at`` (or earlier, with a stage due sooner)."""

    at: float


@dataclasses.dataclass(frozen=True)
class Wait:
    """Write it back once the pod's node is Ready again (:meth:`Ownership.node_ready`)."""


@dataclasses.dataclass(frozen=True)
class Adopt:
    """Take ``status``, an end another writer gave the pod, as its life; ``rewrite``: the
    engine's own write went over it, so write it back."""

    status: Mapping[str, Any]
    rewrite: bool = False


Action = Heal | Wait | Adopt | None


class Ownership:
    """How the status the watch last showed of one pod compares with the engine's own."""

    __slots__ = ("diverged", "ended", "expected", "heal_at", "missed", "reported", "seen",
                 "writing")

    def __init__(self, *, reported: bool) -> None:
        #: Whether the API shows a status an engine wrote (before, there is none of its own to
        #: compare: the first stage writes it).
        self.reported = reported
        self.seen: Owned | None = None  # the owned part of the status last watched
        self.expected: Owned | None = None  # that of the engine's own (None: not yet known)
        self.diverged = False  # the watch last showed another writer's status
        self.heal_at: float | None = None  # when the engine's own is written back
        self.writing = False  # a step's writes are on their way
        self.missed = False  # the watch showed the pod meanwhile
        self.ended: Mapping[str, Any] | None = None  # a terminal status it showed meanwhile

    def watched(self, status: Mapping[str, Any], expected: Callable[[], Owned], *,
                node_ready: bool, deleting: bool, now: float) -> Action:
        """The watch shows ``status``; ``expected``: the engine's own, owned part."""
        self.seen = owned(status)
        if not self.writing:
            return self._compare(self.seen, status, expected, node_ready=node_ready,
                                 deleting=deleting, now=now)
        self.missed = True
        if phase(self.seen) in TERMINAL:
            self.ended = status
        return None

    def writes(self) -> float | None:
        """A step's writes begin; the write back they also are (if one is due), for
        :meth:`written`."""
        self.writing = True
        return self.heal_at

    def written(self, *, reported: bool, healing: float | None, expected: Callable[[], Owned],
                node_ready: bool, deleting: bool, now: float) -> Action:
        """A step's writes are over, committed (``reported``: its status write succeeded) or
        failed; ``healing``: what :meth:`writes` returned. Judges what the watch showed
        meanwhile."""
        ended, missed = self.ended, self.missed
        self.writing, self.ended, self.missed = False, None, False
        if reported:
            self.reported, self.expected = True, None
            if self.heal_at == healing:
                self.heal_at = None  # written back (a newer change of another's stays due)
        if ended is not None and judge(owned(ended), expected(), node_ready=True) is \
                Verdict.ADOPT:
            seen = self.seen
            return Adopt(ended, rewrite=seen is not None and phase(seen) not in TERMINAL)
        if missed and self.seen is not None:
            return self._compare(self.seen, None, expected, node_ready=node_ready,
                                 deleting=deleting, now=now)
        return None

    def stopped(self) -> None:
        """A step ended by a defect or a stop, neither committed nor failed as the API said."""
        self.writing, self.ended, self.missed = False, None, False

    def adopted(self) -> None:
        """The pod's life is now what the API shows: nothing differs, nothing to write."""
        self.expected, self.diverged, self.heal_at = None, False, None

    def node_ready(self, now: float) -> Action:
        """The pod's node is Ready again."""
        if self.diverged and self.heal_at is None:
            self.heal_at = now + HEAL_AFTER
            return Heal(self.heal_at)
        return None

    def _compare(self, seen: Owned, status: Mapping[str, Any] | None,
                 expected: Callable[[], Owned], *, node_ready: bool, deleting: bool,
                 now: float) -> Action:
        """``status``: what ``seen`` was made of (None only when it shows no end: ends seen
        while writing are kept in :attr:`ended`)."""
        if not self.reported or deleting:
            self.diverged, self.heal_at = False, None  # none of its own yet, or going: let be
            return None
        verdict = judge(seen, expected(), node_ready=node_ready)
        self.diverged = verdict is not Verdict.AGREES
        if verdict is Verdict.AGREES:
            self.heal_at = None
        elif verdict is Verdict.ADOPT:
            return Adopt(status) if status is not None else None
        elif verdict is Verdict.WAIT:
            return Wait()
        elif self.heal_at is None:
            self.heal_at = now + HEAL_AFTER
            return Heal(self.heal_at)
        return None
