"""A recorded pod's life, read from what its status says: when it was created, started and
finished, how its containers exited, and which controller made it.

Times come from the pod's own stamps (``creationTimestamp``; each container's ``startedAt``
and ``finishedAt``), which the API server and the kubelet set when it happened, not from when
the recorder happened to see it: a pod that started before the recording began has its start
too (its times are then negative: before the trace's start). The stamps have whole seconds.

A pod's ordinal is its place among its owner's pods, by creation time then name, over every
pod the recording saw (deleted ones included): :func:`numbered` gives them once the recording
ends. Pure functions; no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from operators.k8s.times import parse
from operators.recording.trace import Owner, PodLife

NANOS = 1_000_000_000


def nanos_since(stamp: str | None, start: float) -> int | None:
    """``stamp`` (RFC 3339) as nanoseconds after ``start`` (seconds since the epoch)."""
    if not stamp:
        return None
    return round((parse(stamp) - start) * NANOS)


def controller(pod: dict[str, Any]) -> Owner | None:
    """The pod's controller, by kind and name, from its controller ownerReference."""
    for reference in pod.get("metadata", {}).get("ownerReferences") or ():
        if reference.get("controller"):
            return Owner(kind=str(reference.get("kind", "")), name=str(reference.get("name", "")))
    return None


def life(cluster: str, pod: dict[str, Any], *, start: float,
         seen: PodLife | None = None) -> PodLife:
    """What ``pod`` (as the API serves it) says of its life so far; what an earlier sight of it
    (``seen``) knew and this one no longer says (a status already emptied by a deletion) is
    kept. The ordinal is 0 until :func:`numbered`."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or ()),
                  *(status.get("containerStatuses") or ())]
    main = status.get("containerStatuses") or ()
    starts = [nanos_since(_state(c, "startedAt"), start) for c in containers]
    started = min((s for s in starts if s is not None), default=None)
    terminated = [(c.get("state") or {}).get("terminated") for c in main]
    finished = exit_code = None
    if main and all(terminated):
        ends = [nanos_since(t.get("finishedAt"), start) for t in terminated if t]
        finished = max((e for e in ends if e is not None), default=None)
        codes = [int(t.get("exitCode", 0)) for t in terminated if t]
        exit_code = next((code for code in codes if code != 0), 0)
    created = nanos_since(metadata.get("creationTimestamp"), start)
    found = PodLife(
        cluster=cluster, namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")), owner=controller(pod), ordinal=0,
        created=created if created is not None else 0, started=started, finished=finished,
        exit_code=exit_code, node=str((pod.get("spec") or {}).get("nodeName") or ""))
    if seen is None:
        return found
    return dataclasses.replace(
        found, started=found.started if found.started is not None else seen.started,
        finished=found.finished if found.finished is not None else seen.finished,
        exit_code=found.exit_code if found.exit_code is not None else seen.exit_code,
        node=found.node or seen.node)


def _state(container: dict[str, Any], field: str) -> str | None:
    state = container.get("state") or {}
    for phase in ("running", "terminated"):
        if isinstance(state.get(phase), dict) and state[phase].get(field):
            return str(state[phase][field])
    return None


def numbered(lives: Iterable[PodLife]) -> tuple[PodLife, ...]:
    """``lives`` with their ordinals (by owner: creation time, then name; a bare pod is 0),
    in the order of creation."""
    ordered = sorted(lives, key=lambda p: (p.created, p.cluster, p.namespace, p.name))
    counts: dict[tuple[str, str, str, str], int] = {}
    result = []
    for found in ordered:
        if found.owner is None:
            result.append(found)
            continue
        key = (found.cluster, found.namespace, found.owner.kind, found.owner.name)
        result.append(dataclasses.replace(found, ordinal=counts.get(key, 0)))
        counts[key] = counts.get(key, 0) + 1
    return tuple(result)
