"""What a recording holds: a cluster's (or a fleet's) objects at the start, every change after
it on one clock, and the lives of the pods that ran, so that a replay can make them happen again
without running anything.

The model follows KWOK's recording (``kwokctl snapshot record``: a YAML stream of objects, then
``ResourcePatch`` entries with ``resource``, ``target``, ``durationNanosecond``, ``method`` and
``template``), so that a KWOK file reads into it and, where the content fits, is written from
it. It adds what KWOK's has no place for: the cluster an entry belongs to (a fleet trace holds
several on one clock) and pod lives, which replay matches to the pods that the real controllers
make (the n-th pod made for a replayed owner gets the n-th recorded life of that owner).

Times are nanoseconds since the trace's start, as KWOK counts them. This module is the data
only: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

#: The methods of a change, as KWOK names them. ``create`` carries the whole object,
#: ``patch`` a JSON merge patch (RFC 7386: custom resources take no strategic-merge patch),
#: ``delete`` nothing.
Method = Literal["create", "patch", "delete"]


@dataclasses.dataclass(frozen=True)
class Resource:
    """A kind as the API serves it: ``apps/v1`` ``deployments``; the core group is ``""``."""

    group: str
    version: str
    resource: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclasses.dataclass(frozen=True)
class Target:
    """One object of one cluster; ``namespace`` is ``""`` for a cluster-scoped one."""

    cluster: str
    resource: Resource
    namespace: str
    name: str


@dataclasses.dataclass(frozen=True)
class Change:
    """One recorded write, ``at`` nanoseconds after the trace's start."""

    at: int
    method: Method
    target: Target
    #: The object (``create``), the merge patch (``patch``), or ``None`` (``delete``).
    template: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Owner:
    """The controller of a recorded pod, by kind and name (UIDs differ between runs)."""

    kind: str
    name: str


@dataclasses.dataclass(frozen=True)
class PodLife:
    """What one recorded pod did. Times are nanoseconds since the trace's start; ``None`` where
    the recording ended first (a pod still pending, or still running)."""

    cluster: str
    namespace: str
    name: str
    #: Its controller, or ``None`` for a bare pod.
    owner: Owner | None
    #: Its place in the order its owner made pods (0 first), by creation time then name.
    ordinal: int
    created: int
    started: int | None = None
    finished: int | None = None
    exit_code: int | None = None
    node: str = ""


@dataclasses.dataclass(frozen=True)
class Trace:
    """A recording of one or more clusters on one clock."""

    #: The clusters recorded, by the names the trace uses (``--into`` maps them on replay).
    clusters: tuple[str, ...]
    #: When recording started (RFC 3339), and how long it ran (nanoseconds).
    started_at: str
    duration: int
    #: The objects as they were at the start, with the cluster each belongs to.
    initial: tuple[tuple[str, dict[str, Any]], ...] = ()
    #: Every change after the start, in the order of ``at``.
    changes: tuple[Change, ...] = ()
    pods: tuple[PodLife, ...] = ()
    #: What was left out on purpose when recording (sanitising rules, resources not asked
    #: for), so that a replay can say it.
    notes: tuple[str, ...] = ()
